"""Answers: what a request may ask, the line at the door, the record, the Answer, where tokens come from."""
