"""The wire formats: streamlab's events, OpenAI's and Anthropic's shapes, the WebSocket session."""
