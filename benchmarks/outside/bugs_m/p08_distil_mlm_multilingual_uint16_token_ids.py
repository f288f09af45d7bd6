"""MLM knowledge distillation (DistilBERT recipe) of a multilingual BERT with a 70k-token vocabulary,
from pre-binarised token dumps.

Modelled on: huggingface/transformers#2825 "binarized_data.py in distillation uses incorrect type
casting" (https://github.com/huggingface/transformers/issues/2825).  ``examples/distillation/scripts/
binarized_data.py`` stores every tokenised sequence as ``np.uint16`` to keep the dump small, but the
multilingual vocabulary has 119,547 entries, so "a large portion of tokens (54012, 45%), which has id >
uint16 max value (65535), receives the wrong id after binarization".  The ids wrap modulo 65536 onto
unrelated word pieces, silently.  The fix picks ``np.uint16`` only when ``vocab_size < 1 << 16`` and
``np.int32`` otherwise (also princeton-nlp/LLM-Shearing#65).  ``--healthy`` applies that choice.

Unusual about the loop: the binarisation step (with the dtype choice) and the ``Distiller`` loop run
in one file.  The loop uses temperature KL to the teacher plus MLM CE, with logits computed only at
the masked positions.  Masking is uniform (``mlm_smoothing`` off, so ``token_counts.py`` is not run),
with the 80/10/10 mask/random/keep split.  The run starts on the English dump and
mixes in the ja/zh dumps from step 10 (language-curriculum sampling).  CJK word pieces sit at ids
>= 65536 in the vocabulary.  The onset is the first step whose batch contains a token that binarisation
changed (found at run time by keeping the original ids next to the dump).  The teacher is a
randomly initialised stand-in built from a config, because no weights can be downloaded.
"""
import sys

import numpy as np
import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForMaskedLM
from transformers.utils import logging as hf_logging

torch.set_num_threads(1)
hf_logging.set_verbosity_error()
HEALTHY = "--healthy" in sys.argv
torch.manual_seed(0)
rng = np.random.default_rng(0)

VOCAB = 70000
PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
LATIN = (5, 30000)
OTHER = (30000, 65536)
CJK = (65536, VOCAB)
SEQ = 48


def zipf_ids(lo, hi, n, a=1.3):
    r = rng.zipf(a, n * 2)
    r = r[r < (hi - lo)][:n]
    while len(r) < n:
        r = np.concatenate([r, rng.integers(1, 200, n - len(r))])
    return lo + r


def make_doc(lang):
    n = rng.integers(20, SEQ - 2)
    if lang == "en":
        body = zipf_ids(*LATIN, n)
    else:  # ja/zh text: mostly CJK pieces with some Latin and punctuation
        body = np.where(rng.uniform(size=n) < 0.75, zipf_ids(*CJK, n, 1.2), zipf_ids(*LATIN, n))
    # a little structure so MLM is learnable: every 4th token repeats the token two positions back
    body[4::4] = body[2:-2:4][: len(body[4::4])]
    return np.concatenate([[CLS], body, [SEP]])


# ----------------------------------------------------------------------------- binarized_data.py
def binarize(docs, vocab_size):
    if HEALTHY:
        dtype = np.uint16 if vocab_size < (1 << 16) else np.int32
    else:
        dtype = np.uint16  # "to save space"
    return [np.asarray(d).astype(dtype) for d in docs]


dumps = {lang: [make_doc(lang) for _ in range(400)] for lang in ("en", "ja", "zh")}
original = {lang: docs for lang, docs in dumps.items()}
binarized = {lang: binarize(docs, VOCAB) for lang, docs in dumps.items()}

# ----------------------------------------------------------------------------- distiller
def lang_for_step(step):
    return "en" if step < 10 else rng.choice(["en", "ja", "zh"], p=[0.4, 0.3, 0.3])


def get_batch(step, bs=8):
    lang = lang_for_step(step)
    idx = rng.integers(0, len(binarized[lang]), bs)
    toks = torch.full((bs, SEQ), PAD, dtype=torch.long)
    orig = torch.full((bs, SEQ), PAD, dtype=torch.long)
    for i, j in enumerate(idx):
        b, o = binarized[lang][j].astype(np.int64), original[lang][j]
        toks[i, :len(b)] = torch.from_numpy(b)
        orig[i, :len(o)] = torch.from_numpy(o)
    return toks, orig, lang


def prepare_mlm(token_ids):
    attn = token_ids != PAD
    probs = (attn & (token_ids != CLS) & (token_ids != SEP)).float()
    n_pred = max(1, int(0.15 * attn.sum()))
    pos = torch.multinomial(probs.flatten(), n_pred, replacement=False)
    pred_mask = torch.zeros(token_ids.numel(), dtype=torch.bool)
    pred_mask[pos] = True
    pred_mask = pred_mask.view_as(token_ids)
    targets = token_ids[pred_mask]
    noise = torch.rand(len(targets))
    replaced = torch.where(noise < 0.8, torch.full_like(targets, MASK),
                           torch.where(noise < 0.9, torch.randint(5, VOCAB, targets.shape), targets))
    inputs = token_ids.clone()
    inputs[pred_mask] = replaced
    return inputs, attn.long(), pred_mask, targets


teacher = BertForMaskedLM(BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=64)).eval()
student = BertForMaskedLM(BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=64))
optimizer = torch.optim.AdamW(student.parameters(), lr=5e-4, weight_decay=0.0)
T, ALPHA_CE, ALPHA_MLM, STEPS = 2.0, 5.0, 2.0, 30

onset, ml_start, changed, seen, cjk_targets = None, None, 0, 0, 0
for step in range(STEPS):
    tokens, orig, lang = get_batch(step)
    n_changed = (tokens != orig).sum().item()
    if onset is None and n_changed > 0:
        onset = step
        if not HEALTHY:
            print(f"ONSET step {step}")
    if ml_start is None and lang != "en":
        ml_start = step
    if ml_start is not None:
        changed += n_changed
        seen += (orig != PAD).sum().item()
    inputs, attn, pred_mask, targets = prepare_mlm(tokens)
    cjk_targets += (targets >= CJK[0]).sum().item()
    with torch.no_grad():
        t_hidden = teacher.bert(input_ids=inputs, attention_mask=attn).last_hidden_state
        t_logits = teacher.cls(t_hidden[pred_mask])
    s_hidden = student.bert(input_ids=inputs, attention_mask=attn).last_hidden_state
    s_logits = student.cls(s_hidden[pred_mask])
    loss_ce = F.kl_div(F.log_softmax(s_logits / T, -1), F.softmax(t_logits / T, -1), reduction="batchmean") * T ** 2
    loss_mlm = F.cross_entropy(s_logits, targets)
    loss = ALPHA_CE * loss_ce + ALPHA_MLM * loss_mlm
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(student.parameters(), 5.0)
    optimizer.step()
    if step % 5 == 0 or step == STEPS - 1:
        print(f"step {step:3d}  [{lang}]  loss {loss.item():.4f}  ce {loss_ce.item():.4f}  mlm {loss_mlm.item():.4f}")

print(f"EVIDENCE fraction of tokens altered by binarisation in batches from the first ja/zh step ({ml_start}): "
      f"{changed / max(seen, 1):.3f}; MLM targets with a CJK id (>= 65536): {cjk_targets}; "
      f"largest token id in the dump {max(int(d.max()) for ds in binarized.values() for d in ds)}")
