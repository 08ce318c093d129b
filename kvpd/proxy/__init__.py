"""The kvpd P/D proxy: a lean asyncio HTTP/1.1 proxy for prefill/decode-disaggregated vLLM."""
