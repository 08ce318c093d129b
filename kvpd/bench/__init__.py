"""`kvpd bench`: the guides' `vllm bench serve` protocols against a deployment's proxy."""
