"""``trim_to_mask`` (program.py's module doc): a batch of sentences padded to 48 columns
with mask 0 runs cut to its longest real row (rounded up to ``trim_step``), and every
answer equals the encoder's eager run on that sentence's real tokens alone, without any
padding; a config that cannot be trimmed safely is refused at load."""
import json
import os

import numpy as np
import pytest

from sampan.serving import ServingError
from sampan.serving.model import load_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import sampan
    from sampan.models import bert
    from sampan.models._config import BertConfig
    sampan.manual_seed(0)
    enc = bert.SentenceEncoder(bert.BertModel(BertConfig(
        vocab_size=60, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=128))).eval()
    folder = str(tmp_path_factory.mktemp("trim"))
    ids = np.ones((2, 8), np.int64)
    prog = sampan.jit.save(enc, os.path.join(folder, "enc.sampan"),
                           (sampan.tensor(ids), sampan.tensor(ids)), dynamic=enc.dynamic)
    return folder, prog, enc


def _model(tiny, name, **cfg):
    folder, prog, _ = tiny
    d = os.path.join(folder, name)
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(dict({"path": os.path.relpath(prog, d), "max_batch_size": 8}, **cfg), f)
    return load_model(name, d)


def test_padded_sentences_run_trimmed_and_answer_as_unpadded(tiny):
    import sampan
    _, _, enc = tiny
    m = _model(tiny, "t", trim_to_mask="attention_mask")
    seen = []
    run = m._run
    m._run = lambda inputs: seen.append(inputs["input_ids"].shape) or run(inputs)
    lengths = (5, 12, 9)
    r = np.random.default_rng(0)
    ids = np.zeros((3, 48), np.int64)
    mask = np.zeros((3, 48), np.int64)
    for i, n in enumerate(lengths):
        ids[i, :n] = r.integers(1, 60, n)
        mask[i, :n] = 1
    out = next(iter(m.infer({"input_ids": ids, "attention_mask": mask}).values()))
    assert seen == [(4, 16)]             # 3 rows padded to bucket 4; 12 columns -> 16
    assert out.shape == (3, 16)
    for i, n in enumerate(lengths):      # each sentence alone, eager, no padding at all
        ref = enc(sampan.tensor(ids[i:i + 1, :n]), sampan.tensor(mask[i:i + 1, :n]))
        np.testing.assert_allclose(out[i], ref.numpy()[0], rtol=1e-4, atol=1e-5)
    # untrimmed, the same model answers the same (to rounding) on all 48 columns
    full = next(iter(_model(tiny, "u").infer({"input_ids": ids,
                                              "attention_mask": mask}).values()))
    np.testing.assert_allclose(out, full, rtol=1e-4, atol=1e-5)
    # a batch whose rows are all real runs as it is
    seen.clear()
    m.infer({"input_ids": ids[:, :16], "attention_mask": np.ones((3, 16), np.int64)})
    assert seen == [(4, 16)]


def test_trim_config_is_checked(tiny):
    with pytest.raises(ServingError, match="trim_to_mask must name an input"):
        _model(tiny, "a", trim_to_mask="mask")
    with pytest.raises(ServingError, match="trim_step must be a positive int"):
        _model(tiny, "b", trim_to_mask="attention_mask", trim_step=0)


def test_sentences_of_different_lengths_share_a_batch_with_pad_axis(tiny):
    """dynamic_batching.pad_axis (batcher.py): three unpadded sentences of 5, 12 and 9
    tokens run as one batch, padded to 12 with mask 0 (nothing left for trim_to_mask to
    cut: 12 rounds up to 16, past the columns there are); each answer equals the
    encoder's eager run on that sentence alone."""
    import asyncio

    import sampan
    from sampan.serving.batcher import Batcher
    _, _, enc = tiny
    m = _model(tiny, "p", trim_to_mask="attention_mask",
               dynamic_batching={"max_queue_delay_us": 300_000, "delay_policy": "fixed",
                                 "pad_axis": {"axis": 1}})
    seen = []
    run = m._run
    m._run = lambda inputs: seen.append(inputs["input_ids"].shape) or run(inputs)
    r = np.random.default_rng(1)
    sents = [r.integers(1, 60, (1, n)).astype(np.int64) for n in (5, 12, 9)]

    async def go():
        b = Batcher(m, 1)
        b.start(warmup=False)
        try:
            loop = asyncio.get_running_loop()
            subs = [b.submit({"input_ids": s, "attention_mask": np.ones_like(s)}, loop)
                    for s in sents]
            return await asyncio.gather(*(f for _, f in subs)), [p.batch for p, _ in subs]
        finally:
            b.close()
    outs, batch = asyncio.run(go())
    assert batch == [3, 3, 3] and seen == [(4, 12)]
    for s, o in zip(sents, outs):
        ref = enc(sampan.tensor(s), sampan.tensor(np.ones_like(s)))
        np.testing.assert_allclose(next(iter(o.values())), ref.numpy(), rtol=1e-4, atol=1e-5)
