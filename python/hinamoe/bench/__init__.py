"""``hina-bench``: benchmarks of HinaMoE against ONNX Runtime's CPU EP.

Subcommands live in their own modules and register themselves in
``hinamoe.bench.cli.SUBCOMMANDS`` (``ffn`` now; ``gqa`` and ``numa-plan`` later).
"""
