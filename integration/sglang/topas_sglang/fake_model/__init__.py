"""A fake causal LM for a real SGLang server on the CPU: only the model's forward is
replaced (:mod:`topas_sglang.fake_model.causal_lm`); the HTTP server, the scheduler's
event loops, the radix cache, ``PrefillAdder``, ``retract_decode`` and chunked prefill are
SGLang's own. SGLang loads it through ``SGLANG_EXTERNAL_MODEL_PACKAGE=topas_sglang.fake_model``
(it imports every module of this package and registers each one's ``EntryClass``), with
``--model-path`` at :data:`MODEL_DIR`, whose config names the class.
``topas_sglang.fake_server`` builds the command line and runs the server.
"""

from pathlib import Path

MODEL_DIR = Path(__file__).resolve().parent / "model"
"""The fake model's folder: a config.json (a tiny Llama shape) that names
``TopasFakeForCausalLM``; no weights (``--load-format dummy``)."""
