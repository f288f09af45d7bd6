"""Textual inversion with accelerate: learn one new token embedding for a frozen text-conditioned denoiser.

Modelled on: huggingface/diffusers ``examples/textual_inversion/textual_inversion.py``
(``tokenizer.add_tokens(placeholder)``, ``resize_token_embeddings``, the new row initialised from an
``initializer_token``; the UNet and all text-encoder parts except the token embedding frozen, the
frozen UNet cast to the mixed-precision ``weight_dtype``; AdamW (weight decay 1e-2) over the
*whole* input-embedding matrix; inside ``accelerator.accumulate(text_encoder)``, after
``optimizer.step()``, every row except the placeholder's is written back from
``orig_embeds_params`` ("Let's make sure we don't update any embedding weights besides the newly
added token"); ``save_progress`` writes ``learned_embeds.bin`` every ``save_steps``).

The "pretrained" pipeline is a stand-in built from configs: a ``CLIPTextModel`` from a small
``CLIPTextConfig`` plus a tiny cross-attention denoiser over 16-d latents, first trained jointly for
40 steps on captions of known concepts and saved with ``save_pretrained`` (nothing is downloaded);
textual inversion starts from ``from_pretrained`` of that folder. Textual inversion then learns
a token for a new concept; the saved embedding is loaded into a fresh copy of the text encoder and
evaluated with a fixed-seed noise/timestep set.

Unusual but correct: the optimizer owns the full embedding matrix but after every micro-batch all
rows but one are overwritten from a saved copy (caption-word rows do get gradients and weight decay,
which is then undone); the text encoder except its token-embedding matrix and the whole denoiser
are frozen; the denoiser runs in bf16 while the trained embedding stays fp32; gradient
accumulation over 2 micro-batches means ``optimizer.step()`` is a no-op on every other call.
"""
import math
import os
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed

torch.set_num_threads(1)

from transformers import CLIPTextConfig, CLIPTextModel, get_scheduler

TEMPLATES = ["a photo of a {}", "a rendering of a {}", "the photo of the {}", "a photo of the small {}",
             "a good photo of a {}", "a close photo of the {}"]
WORDS = ["<pad>", "<bos>", "<eos>", "a", "the", "photo", "rendering", "of", "small", "good", "close",
         "cat", "dog", "car", "tree", "house", "ball", "red", "blue"]
OBJECTS = ["cat", "dog", "car", "tree", "house", "ball"]
MAX_LEN, LATENT = 10, 16


class WordTokenizer:
    def __init__(self, words):
        self.vocab = {w: i for i, w in enumerate(words)}

    def add_tokens(self, token):
        self.vocab[token] = len(self.vocab)
        return 1

    def convert_tokens_to_ids(self, token):
        return self.vocab[token]

    def __len__(self):
        return len(self.vocab)

    def __call__(self, text):
        ids = [1] + [self.vocab[w] for w in text.split()] + [2]
        return torch.tensor(ids + [0] * (MAX_LEN - len(ids)))


class CrossAttnDenoiser(nn.Module):
    """Stand-in for the UNet: latent + timestep embedding, cross-attends to the text states."""

    def __init__(self, text_dim=64, dim=64):
        super().__init__()
        self.inp = nn.Linear(LATENT, dim)
        self.t_emb = nn.Sequential(nn.Linear(32, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.attn = nn.MultiheadAttention(dim, 4, kdim=text_dim, vdim=text_dim, batch_first=True)
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Sequential(nn.Linear(dim, 128), nn.SiLU(), nn.Linear(128, LATENT))

    def forward(self, x, t, encoder_hidden_states, pad_mask):
        freqs = torch.exp(-math.log(1000) * torch.arange(16, device=x.device) / 16)
        emb = torch.cat([torch.sin(t[:, None] * freqs), torch.cos(t[:, None] * freqs)], 1).to(x.dtype)
        h = self.inp(x) + self.t_emb(emb)
        a, _ = self.attn(h[:, None], encoder_hidden_states, encoder_hidden_states, key_padding_mask=pad_mask)
        return self.out(self.norm(h + a[:, 0]))


class DDPMNoise:
    def __init__(self, num_train_timesteps=100):
        betas = torch.linspace(1e-4, 0.05, num_train_timesteps)
        self.alphas_cumprod = torch.cumprod(1 - betas, 0)
        self.num_train_timesteps = num_train_timesteps

    def add_noise(self, x0, noise, t):
        a = self.alphas_cumprod[t].to(x0.dtype)[:, None]
        return a.sqrt() * x0 + (1 - a).sqrt() * noise


def concept_batch(g, means, names, tok, n, word=None):
    idx = g.integers(0, len(names), n)
    latents = np.stack([means[names[i]] for i in idx]) + 0.1 * g.standard_normal((n, LATENT))
    caps = [TEMPLATES[g.integers(0, len(TEMPLATES))].format(word or names[i]) for i in idx]
    return torch.tensor(latents, dtype=torch.float32), torch.stack([tok(c) for c in caps])


def denoise_loss(text_encoder, unet, sched, latents, ids, noise, t, dtype):
    states = text_encoder(ids)[0].to(dtype=dtype)
    noisy = sched.add_noise(latents, noise, t).to(dtype)
    pred = unet(noisy, t, states, ids == 0)
    return F.mse_loss(pred.float(), noise.float(), reduction="mean")


@torch.no_grad()
def fixed_eval(text_encoder, unet, sched, latents, ids, dtype):
    g = torch.Generator().manual_seed(99)           # same noise and timesteps for every evaluation
    noise = torch.randn(latents.shape, generator=g)
    t = torch.randint(0, sched.num_train_timesteps, (len(latents),), generator=g)
    return denoise_loss(text_encoder, unet, sched, latents, ids, noise, t, dtype).item()


def main():
    set_seed(0)
    g = np.random.default_rng(0)
    means = {o: 1.5 * g.standard_normal(LATENT) for o in OBJECTS}; means["<cat-toy>"] = 0.5 * (means["cat"] + means["house"])
    tok = WordTokenizer(WORDS)
    sched = DDPMNoise()
    work = tempfile.TemporaryDirectory()
    pretrained_dir, output_dir = os.path.join(work.name, "pretrained"), os.path.join(work.name, "out")
    os.makedirs(output_dir)

    # ---- stand-in for the pretrained pipeline: joint training on known concepts, then saved ---------
    config = CLIPTextConfig(vocab_size=len(WORDS), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=4, max_position_embeddings=MAX_LEN, pad_token_id=0,
                            bos_token_id=1, eos_token_id=2)
    text_encoder, unet = CLIPTextModel(config), CrossAttnDenoiser()
    opt = torch.optim.AdamW(list(text_encoder.parameters()) + list(unet.parameters()), lr=3e-3)
    for step in range(40):
        lat, ids = concept_batch(g, means, OBJECTS, tok, 64)
        t = torch.randint(0, sched.num_train_timesteps, (64,))
        loss = denoise_loss(text_encoder, unet, sched, lat, ids, torch.randn_like(lat), t, torch.float32)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"base pipeline denoising loss after pre-training: {loss.item():.4f}")
    text_encoder.save_pretrained(pretrained_dir)
    torch.save(unet.state_dict(), os.path.join(pretrained_dir, "unet.pt"))
    del text_encoder, unet, opt

    # ---- textual inversion ------------------------------------------------------------------
    accelerator = Accelerator(gradient_accumulation_steps=2, mixed_precision="bf16", cpu=True)
    text_encoder = CLIPTextModel.from_pretrained(pretrained_dir)
    unet = CrossAttnDenoiser()
    unet.load_state_dict(torch.load(os.path.join(pretrained_dir, "unet.pt")))
    placeholder, initializer = "<cat-toy>", "ball"
    tok.add_tokens(placeholder)
    placeholder_token_ids = [tok.convert_tokens_to_ids(placeholder)]
    initializer_token_id = tok.convert_tokens_to_ids(initializer)
    text_encoder.resize_token_embeddings(len(tok))
    token_embeds = text_encoder.get_input_embeddings().weight.data
    with torch.no_grad():
        for token_id in placeholder_token_ids:
            token_embeds[token_id] = token_embeds[initializer_token_id].clone()

    weight_dtype = torch.bfloat16
    unet.requires_grad_(False)
    unet.to(dtype=weight_dtype)
    text_encoder.text_model.encoder.requires_grad_(False)
    text_encoder.text_model.final_layer_norm.requires_grad_(False)
    text_encoder.text_model.embeddings.position_embedding.requires_grad_(False)

    val_lat, val_ids = concept_batch(np.random.default_rng(5), means, [placeholder], tok, 128)
    print(f"new concept, before: {fixed_eval(text_encoder, unet, sched, val_lat, val_ids, weight_dtype):.4f}")

    train_lat, train_ids = concept_batch(np.random.default_rng(6), means, [placeholder], tok, 48 * 16)
    train_dataloader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(train_lat, train_ids),
                                                   batch_size=16, shuffle=True)
    optimizer = torch.optim.AdamW(text_encoder.get_input_embeddings().parameters(), lr=5e-2,
                                  betas=(0.9, 0.999), weight_decay=1e-2, eps=1e-8)
    lr_scheduler = get_scheduler("constant", optimizer=optimizer, num_warmup_steps=0)
    text_encoder, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        text_encoder, optimizer, train_dataloader, lr_scheduler)
    orig_embeds_params = accelerator.unwrap_model(text_encoder).get_input_embeddings().weight.data.clone()

    global_step, save_steps = 0, 8
    save_path = os.path.join(output_dir, "learned_embeds.bin")
    text_encoder.train()
    for step, (latents, input_ids) in enumerate(train_dataloader):
        with accelerator.accumulate(text_encoder):
            noise = torch.randn_like(latents)
            timesteps = torch.randint(0, sched.num_train_timesteps, (latents.shape[0],))
            loss = denoise_loss(text_encoder, unet, sched, latents, input_ids, noise, timesteps, weight_dtype)
            accelerator.backward(loss)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            # make sure no embedding row other than the new token changes
            index_no_updates = torch.ones((len(tok),), dtype=torch.bool)
            index_no_updates[min(placeholder_token_ids):max(placeholder_token_ids) + 1] = False
            with torch.no_grad():
                accelerator.unwrap_model(text_encoder).get_input_embeddings().weight[
                    index_no_updates] = orig_embeds_params[index_no_updates]
        if accelerator.sync_gradients:
            global_step += 1
            if global_step % save_steps == 0:
                learned = accelerator.unwrap_model(text_encoder).get_input_embeddings().weight[
                    min(placeholder_token_ids):max(placeholder_token_ids) + 1]
                torch.save({placeholder: learned.detach().cpu()}, save_path)
                print(f"step {global_step}: loss {loss.item():.4f}, saved {os.path.basename(save_path)}")

    drift = (accelerator.unwrap_model(text_encoder).get_input_embeddings().weight.detach()[:-1]
             - orig_embeds_params[:-1]).abs().max().item()
    print(f"optimizer steps {global_step}; max drift of the other embedding rows: {drift:.1e}")

    # load the learned embedding into a fresh copy of the pretrained text encoder
    fresh = CLIPTextModel.from_pretrained(pretrained_dir)
    fresh.resize_token_embeddings(len(tok))
    learned_embeds = torch.load(save_path)[placeholder]
    with torch.no_grad():
        fresh.get_input_embeddings().weight[placeholder_token_ids[0]] = learned_embeds[0]
    print(f"new concept, after (reloaded embedding): "
          f"{fixed_eval(fresh, unet, sched, val_lat, val_ids, weight_dtype):.4f}")
    work.cleanup()


if __name__ == "__main__":
    main()
