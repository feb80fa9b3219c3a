"""The fuzzing campaign driver: CLI, reproducer corpus, replay, planted mutants, certify."""
