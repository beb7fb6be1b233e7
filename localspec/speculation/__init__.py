"""Draft sources for speculative decoding (the EAGLE drafter; more sources plug in here)."""
