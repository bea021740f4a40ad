"""Where the lab's and the book's results go: runs recorded for later chapters, the prompts, the benchmarks' reports."""
