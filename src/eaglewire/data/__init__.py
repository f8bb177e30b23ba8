"""Training data: conversations, regeneration by the target, chat-template loss masks, features."""
