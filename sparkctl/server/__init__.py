"""Talking to a running OpenAI-compatible server: health gating, the smoke chat, streamed chat."""
