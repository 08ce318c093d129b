"""vLLM KV connectors bundled with kvpd (loaded by the engine through kv_connector_module_path)."""
