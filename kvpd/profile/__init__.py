"""The cluster profile: schema (pydantic), YAML loading with line numbers, bundled profiles."""
