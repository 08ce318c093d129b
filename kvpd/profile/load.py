"""Load a profile from YAML: keep each value's line, turn schema errors into located messages.

Every message has the form `<file>:<line>: <field.path>: <what is wrong>. <how to fix>`; the
SkyPilot-style "did you mean" is computed from the fields the schema allows at that place.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kvpd.errors import ProfileError
from kvpd.profile.messages import Path_, dotted, schema_messages
from kvpd.profile.schema import Profile

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


MAX_PROFILE_BYTES = 1 << 20  # a profile is a few KB; 1 MiB leaves room for 1,024-host inventories
MAX_VALUES = 200_000  # values after alias expansion: bounds an alias bomb to milliseconds


def _yaml_node(text: str, name: str) -> yaml.Node | None:
    if len(text) > MAX_PROFILE_BYTES:
        raise ProfileError(
            f"{name}: {len(text)} characters is larger than a profile can be "
            f"({MAX_PROFILE_BYTES}). Check that this is the right file."
        )
    try:
        return yaml.compose(text, Loader=_LOADER)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{name}:{mark.line + 1}" if mark else name
        problem = getattr(e, "problem", None) or str(e)
        raise ProfileError(
            f"{where}: not valid YAML: {problem}. Check indentation and quoting."
        ) from None
    except RecursionError:
        raise ProfileError(f"{name}: nested too deeply to be a profile.") from None


class _Composer:
    """YAML nodes -> plain data, recording the line of every key and list item and counting
    the values (aliases included) against MAX_VALUES."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lines: dict[Path_, int] = {}
        self.count = 0
        self.active: set[int] = set()
        self.done: dict[int, tuple[Any, int]] = {}  # node id -> (value, values in it): aliases
        self.scalars = yaml.SafeLoader("")

    def fail(self, n: yaml.Node, path: Path_, what: str) -> ProfileError:
        return ProfileError(f"{self.name}:{n.start_mark.line + 1}: {dotted(path)}: {what}")

    def grow(self, n: yaml.Node, path: Path_, by: int) -> None:
        self.count += by
        if self.count > MAX_VALUES:
            raise self.fail(
                n,
                path,
                f"the profile expands to more than {MAX_VALUES} values (aliases repeated "
                "inside aliases?). Write the values out instead of nesting aliases.",
            )

    def walk(self, n: yaml.Node | None, path: Path_) -> Any:
        if n is None:
            return None
        if id(n) in self.done:  # an alias of a node already read: count its values again
            seen, size = self.done[id(n)]
            self.grow(n, path, size)  # raises before copying once the total is too large
            return copy.deepcopy(seen)  # --set and inventories must not change both places
        if id(n) in self.active:
            raise self.fail(n, path, "an alias refers to itself. Remove the recursive alias.")
        before = self.count
        self.grow(n, path, 1)
        value: Any
        if isinstance(n, yaml.MappingNode):
            value = self._mapping(n, path)
        elif isinstance(n, yaml.SequenceNode):
            value = self._sequence(n, path)
        else:
            value = self._scalar(n, path)
        self.done[id(n)] = (value, self.count - before)
        return value

    def _mapping(self, n: yaml.MappingNode, path: Path_) -> dict[Any, Any]:
        self.active.add(id(n))
        out: dict[Any, Any] = {}
        for k, v in n.value:
            if not isinstance(k, yaml.ScalarNode):
                raise self.fail(k, path, "a key must be plain text. Write `name: value`.")
            key = k.value
            sub = path + (key,)
            if key in out:
                raise self.fail(k, sub, "key appears twice. Keep one of them.")
            self.lines[sub] = k.start_mark.line + 1
            out[key] = self.walk(v, sub)
        self.active.discard(id(n))
        return out

    def _sequence(self, n: yaml.SequenceNode, path: Path_) -> list[Any]:
        self.active.add(id(n))
        items = []
        for i, v in enumerate(n.value):
            self.lines[path + (i,)] = v.start_mark.line + 1
            items.append(self.walk(v, path + (i,)))
        self.active.discard(id(n))
        return items

    def _scalar(self, n: yaml.Node, path: Path_) -> Any:
        try:
            value = self.scalars.construct_object(n, deep=True)
        except (yaml.YAMLError, ValueError, OverflowError) as e:
            problem = getattr(e, "problem", None) or str(e)
            raise self.fail(
                n, path, f"cannot read this value ({problem}). Quote it as text."
            ) from None
        if isinstance(value, str) and "\x00" in value:
            raise self.fail(n, path, "contains a NUL character. Remove it.")
        return value


def _compose(text: str, name: str) -> tuple[Any, dict[Path_, int]]:
    """YAML text -> plain data plus the line of every key and list item.

    Aliases are expanded here, counted against MAX_VALUES (a 10-line alias bomb would otherwise
    expand to billions of values) and refused when they refer to themselves.
    """
    node = _yaml_node(text, name)
    composer = _Composer(name)
    try:
        data = composer.walk(node, ())
    except RecursionError:
        raise ProfileError(f"{name}: nested too deeply to be a profile.") from None
    finally:
        composer.scalars.dispose()
    return data, composer.lines


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
                raise ProfileError(
                    f"--set {item!r}: {part} is not a mapping in this profile. Set {part} "
                    "itself, or check the field path (`kvpd schema`)."
                )
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
    # Every --set is part of the plan digest: bench results with other settings must differ.
    text = text + "".join(f"\n# --set {s}" for s in sets or [])
    source = Source(name=name, text=text, lines=lines)
    try:
        profile = Profile.model_validate(data)
    except ValidationError as e:
        problems = [
            f"{source.where(loc)}: {dotted(loc)}: {msg}" for loc, msg in schema_messages(e, data)
        ]
        raise ProfileError(problems) from None
    return profile, source


def bundled_names() -> list[str]:
    root = resources.files("kvpd") / "profiles"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def read_text_file(path: Path, what: str) -> str:
    """A profile or inventory file as text, refusing directories, huge and binary files."""
    if path.is_dir():
        raise ProfileError(
            f"{path}: is a directory, not the {what} file. Pass the YAML file in it."
        )
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_PROFILE_BYTES + 1)
    except OSError as e:
        raise ProfileError(
            f"{path}: cannot read the {what} file ({e.strerror or e}). Check its permissions."
        ) from None
    if len(raw) > MAX_PROFILE_BYTES:
        raise ProfileError(
            f"{path}: larger than {MAX_PROFILE_BYTES} bytes, too large for a {what}. "
            "Check that this is the right file."
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProfileError(
            f"{path}: not a text file (byte {e.start} is not UTF-8). A {what} is a YAML "
            "text file; check that this is the right file."
        ) from None


def read_profile_text(arg: str) -> tuple[str, str]:
    """Resolve PROFILE (a file path or a bundled profile name) to (text, display name)."""
    path = Path(arg)
    if path.exists():
        return read_text_file(path, "profile"), str(path)
    if "/" not in arg and not arg.endswith((".yaml", ".yml")):
        res = resources.files("kvpd") / "profiles" / f"{arg}.yaml"
        if res.is_file():
            return res.read_text(), f"bundled:{arg}"
    names = ", ".join(bundled_names())
    raise ProfileError(
        f"{arg}: no such profile file, and not a bundled profile. Bundled profiles: {names}. "
        "Pass a path to a YAML file or one of those names."
    )


INVENTORY_KEYS = ("hosts", "ssh", "rehearsal")


def load_inventory(path: str) -> dict[str, Any]:
    """An inventory file: a partial profile (hosts, ssh, rehearsal, ...) merged over it."""
    p = Path(path)
    if not p.exists():
        raise ProfileError(f"{path}: no such inventory file. Check the --inventory path.")
    data, lines = _compose(read_text_file(p, "inventory"), path)
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: an inventory is a YAML mapping (hosts:, ssh:, rehearsal:).")
    # Machine facts only: an inventory (often kept apart from the reviewed profile, per site)
    # must not change what is served or how (model, engine flags, env, bench, proxy ...).
    for key in data:
        if key not in INVENTORY_KEYS:
            line = lines.get((key,))
            raise ProfileError(
                f"{path}{f':{line}' if line else ''}: {key}: an inventory holds machine facts "
                f"only ({', '.join(INVENTORY_KEYS)}); set {key} in the profile or with --set."
            )
    return data


def load_profile(
    arg: str, sets: list[str] | None = None, inventory: str | None = None
) -> tuple[Profile, Source]:
    """Read and parse PROFILE (path or bundled name), with an inventory and --set overrides."""
    from kvpd.profile.model_facts import read_config

    text, name = read_profile_text(arg)
    overlay = load_inventory(inventory) if inventory else None
    return parse_profile(text, name, sets, overlay, config_reader=read_config)
