"""Load a profile from YAML: keep each value's line, turn schema errors into located messages.

Every message has the form `<file>:<line>: <field.path>: <what is wrong>. <how to fix>`; the
SkyPilot-style "did you mean" is computed from the fields the schema allows at that place.
"""

from __future__ import annotations

import difflib
import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from kvpd.errors import ProfileError
from kvpd.profile.schema import Profile

Path_ = tuple[str | int, ...]
# libyaml is ~10x faster at composing large profiles; same nodes, same line marks
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class Source:
    """Where a profile came from, with the line of every field for messages."""

    name: str  # file path or "bundled:<name>"
    text: str
    lines: dict[Path_, int]

    def line(self, path: Path_) -> int | None:
        """Line of `path`, or of its nearest ancestor that has one."""
        p = tuple(path)
        while p:
            if p in self.lines:
                return self.lines[p]
            p = p[:-1]
        return None

    def where(self, path: Path_) -> str:
        line = self.line(path)
        return f"{self.name}:{line}" if line else self.name

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:16]


def dotted(path: Path_) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _compose(text: str, name: str) -> tuple[Any, dict[Path_, int]]:
    try:
        node = yaml.compose(text, Loader=_LOADER)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{name}:{mark.line + 1}" if mark else name
        problem = getattr(e, "problem", None) or str(e)
        raise ProfileError(
            f"{where}: not valid YAML: {problem}. Check indentation and quoting."
        ) from None
    lines: dict[Path_, int] = {}

    def walk(n: yaml.Node | None, path: Path_) -> Any:
        if n is None:
            return None
        if isinstance(n, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for k, v in n.value:
                key = k.value
                sub = path + (key,)
                if key in out:
                    raise ProfileError(
                        f"{name}:{k.start_mark.line + 1}: {dotted(sub)}: key appears twice. "
                        "Keep one of them."
                    )
                lines[sub] = k.start_mark.line + 1
                out[key] = walk(v, sub)
            return out
        if isinstance(n, yaml.SequenceNode):
            items = []
            for i, v in enumerate(n.value):
                lines[path + (i,)] = v.start_mark.line + 1
                items.append(walk(v, path + (i,)))
            return items
        loader = yaml.SafeLoader("")
        try:
            return loader.construct_object(n, deep=True)
        finally:
            loader.dispose()

    data = walk(node, ())
    return data, lines


def _model_at(path: Path_) -> type[BaseModel] | None:
    """The pydantic model that validates the mapping at `path` (for "did you mean")."""
    model: Any = Profile
    parts = list(path)
    i = 0
    while i < len(parts):
        part = parts[i]
        i += 1
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        model = _unwrap(field.annotation)
        if get_origin(model) is dict:  # e.g. hosts: the next element is a key (a host name)
            args = get_args(model)
            model = _unwrap(args[1]) if len(args) == 2 else None
            i += 1
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unwrap(tp: Any) -> Any:
    """Strip Optional/Union-with-None and list[...] to the interesting inner type."""
    while True:
        origin = get_origin(tp)
        if origin is list:
            tp = get_args(tp)[0]
            continue
        if origin is not None and type(None) in get_args(tp):
            rest = [a for a in get_args(tp) if a is not type(None)]
            if len(rest) == 1:
                tp = rest[0]
                continue
        return tp


def _message(err: dict[str, Any]) -> tuple[Path_, str]:
    loc: Path_ = tuple(err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        key = str(loc[-1])
        model = _model_at(loc[:-1])
        allowed = sorted(model.model_fields) if model else []
        close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        listing = f" Allowed here: {', '.join(allowed)}." if allowed and not close else ""
        return loc, f"unknown field '{key}'.{hint}{listing}"
    if kind == "missing":
        return loc, "required field is missing. Add it."
    inp = err.get("input")
    shown = repr(inp) if not isinstance(inp, (dict, list)) else type(inp).__name__
    msg = err["msg"]
    if kind == "literal_error":
        return loc, f"{shown} is not allowed: {msg[0].lower() + msg[1:]}."
    return loc, f"{shown}: {msg[0].lower() + msg[1:]}."


def apply_sets(data: dict[str, Any], sets: list[str]) -> None:
    """Apply `--set a.b.c=value` overrides (value parsed as YAML) to raw profile data."""
    for item in sets:
        key, eq, raw = item.partition("=")
        if not eq or not key.strip():
            raise ProfileError(f"--set {item!r}: write FIELD.PATH=VALUE, e.g. proxy.port=9000.")
        parts = key.strip().split(".")
        node: Any = data
        for part in parts[:-1]:
            nxt = node.get(part) if isinstance(node, dict) else None
            if nxt is None:
                nxt = {}
                node[part] = nxt
            if not isinstance(nxt, dict):
                raise ProfileError(f"--set {item!r}: {part} is not a mapping in this profile.")
            node = nxt
        try:
            node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            node[parts[-1]] = raw


def merge_overlay(data: dict[str, Any], overlay: dict[str, Any]) -> None:
    """Deep-merge an inventory (hosts' real addresses, ssh settings, rehearsal paths)."""
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            merge_overlay(data[key], value)
        else:
            data[key] = value


def parse_profile(
    text: str,
    name: str,
    sets: list[str] | None = None,
    overlay: dict[str, Any] | None = None,
    config_reader: Any = None,
) -> tuple[Profile, Source]:
    """Parse YAML text into a Profile. Pure (no I/O). Raises ProfileError with every problem."""
    data, lines = _compose(text, name)
    if not isinstance(data, dict):
        raise ProfileError(f"{name}: a profile is a YAML mapping (name:, hosts:, model:, ...).")
    if overlay:
        merge_overlay(data, overlay)
        text = text + "\n# inventory " + yaml.safe_dump(overlay, sort_keys=True)
    if sets:
        apply_sets(data, sets)
    model = data.get("model")
    if isinstance(model, dict) and model.get("config") and config_reader is not None:
        from kvpd.profile.model_facts import facts_from_config

        for key, value in facts_from_config(config_reader(str(model["config"]))).items():
            if model.get(key) is None:
                model[key] = value
        text = text + "".join(f"\n# --set {s}" for s in sets)  # part of the digest
    source = Source(name=name, text=text, lines=lines)
    try:
        profile = Profile.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            loc, msg = _message(err)
            problems.append(f"{source.where(loc)}: {dotted(loc)}: {msg}")
        raise ProfileError(problems) from None
    return profile, source


def bundled_names() -> list[str]:
    root = resources.files("kvpd") / "profiles"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def read_profile_text(arg: str) -> tuple[str, str]:
    """Resolve PROFILE (a file path or a bundled profile name) to (text, display name)."""
    path = Path(arg)
    if path.is_file():
        return path.read_text(), str(path)
    if "/" not in arg and not arg.endswith((".yaml", ".yml")):
        res = resources.files("kvpd") / "profiles" / f"{arg}.yaml"
        if res.is_file():
            return res.read_text(), f"bundled:{arg}"
    names = ", ".join(bundled_names())
    raise ProfileError(
        f"{arg}: no such profile file, and not a bundled profile. Bundled profiles: {names}. "
        "Pass a path to a YAML file or one of those names."
    )


def load_inventory(path: str) -> dict[str, Any]:
    """An inventory file: a partial profile (hosts, ssh, rehearsal, ...) merged over it."""
    p = Path(path)
    if not p.is_file():
        raise ProfileError(f"{path}: no such inventory file.")
    data, _ = _compose(p.read_text(), path)
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: an inventory is a YAML mapping (hosts:, ssh:, rehearsal:).")
    return data


def load_profile(
    arg: str, sets: list[str] | None = None, inventory: str | None = None
) -> tuple[Profile, Source]:
    """Read and parse PROFILE (path or bundled name), with an inventory and --set overrides."""
    from kvpd.profile.model_facts import read_config

    text, name = read_profile_text(arg)
    overlay = load_inventory(inventory) if inventory else None
    return parse_profile(text, name, sets, overlay, config_reader=read_config)
