"""Other people's programs the experiments run: redis-server, llama.cpp's server, curl, Chromium, the rival servers."""
