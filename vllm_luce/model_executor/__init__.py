"""Luce model executors: vLLM's model classes plus the attachment points of the features."""
