"""Coverage-guided fuzzing harnesses (atheris): one module ``fuzz_<target>.py`` per target, each with an oracle
beyond "no exception". ``run.py`` runs one under libFuzzer; ``test_fuzz_runs.py`` runs each for a few thousand
inputs as part of the suite; ``bench/fuzz.py`` runs each for a million. See docs/testing.md."""
