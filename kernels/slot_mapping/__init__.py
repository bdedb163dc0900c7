"""kvfence's slot-mapping kernel (vLLM's model runner V2 ABI): docs/contract.md §11."""
