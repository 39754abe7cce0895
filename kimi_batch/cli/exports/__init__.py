"""`kimi-batch export`'s training formats: which rows (`selection`), each as the conversation the
teacher saw (`conversation`), the Hugging Face folder (`hf`) and its card (`card`)."""
