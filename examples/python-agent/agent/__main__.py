"""A stand-in agent: prints where it runs and what it can see."""
import os

print("agent running in", os.getcwd())
print("files:", sorted(os.listdir(".")))
print("ANTHROPIC_API_KEY set:", bool(os.environ.get("ANTHROPIC_API_KEY")))
