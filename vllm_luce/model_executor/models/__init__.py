"""One module per model family; each class is `LuceExecutor` mixed into vLLM's own class."""
