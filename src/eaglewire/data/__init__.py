"""Training data: conversations, regeneration by the target (or a server), chat-template loss masks,
the target's own prompts; the tokenised samples capture and training read."""
