"""Datasets for the three agentic tasks (method §9): one normalized schema, loaders from the
published formats, Great Expectations validation, and the embedded default data.

    schema.py      Example / Passage and the on-disk JSONL form
    loaders.py     DeepScaleR, AIME24, AMC23, MATH500, MinervaMath, OlympiadBench, MMLU-Pro, ARC-c,
                   GPQA-diamond, HotpotQA, 2WikiMultiHopQA, MuSiQue, Bamboogle, BFCL -> Example
    reading.py     strict UTF-8, a maximum row size and JSON per line, bad lines named (file:line)
    validation.py  a GX suite per kind (math, mc, qa, fc, corpus); load_validated() raises on bad rows
                   (CLI: python -m trace_core.data.validation FILE...)
    hashing.py     version-proof hash draws and splits
    arith.py       generated arithmetic/algebra word problems (math + Python tool)
    kb.py          generated fictional knowledge base, passage corpus and 2-4-hop questions
    bfcl.py        BFCL v4 multi-turn from bfcl-eval: loading, per-scenario 80/20 split, subset
    generate.py    writes data/ and verifies it against data.dvc (CLI: python -m trace_core.data.generate)

Importing this package is cheap: pandas, pyarrow, Great Expectations, bfcl-eval and dvc-data are
imported only by the functions that need them.
"""
