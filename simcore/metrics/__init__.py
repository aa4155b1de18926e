"""Per-request results and summary metrics in the language of ``vllm bench serve``."""
