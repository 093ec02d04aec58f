"""twell's native model runtime from Python: load a Hugging Face Llama checkpoint, tokenize, and generate.

    import twell.model
    m = twell.model.Model("assets/smollm2-135m-instruct")         # the GPU where there is one, else the CPU
    print(m.generate("What is the capital of France?", chat=True, max_new_tokens=32))

The same runtime as `twell generate` (C++: ReLU FFNs through twell's sparse path when a layer measures
sparse enough, other activations dense; CUDA graphs and device-side sampling on the GPU). No PyTorch
is needed. Text needs the checkpoint's tokenizer.json; token ids work without it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Union

from . import _twell

__all__ = ["Model", "Generation"]


@dataclass
class Generation:
    """One prompt's continuation: the generated ids (the stop token included when one ended it), their
    text (when the model has a tokenizer) and why it stopped ("eos", "stop token", "max tokens",
    "context full")."""

    tokens: list[int]
    stop_reason: str
    text: Optional[str] = None


@dataclass
class GenerateStats:
    """Times of the last generate call: prefill (all prompts in one batch) and decode steps."""

    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else float("nan")


def _text(b: bytes) -> str:
    return b.decode("utf-8", errors="replace")


class Model:
    """A checkpoint directory (config.json, model.safetensors or its shards, tokenizer.json) on twell's
    native runtime.

    device: "auto" (CUDA where this build has it and a GPU is usable, else the CPU), "cpu" or "cuda".
    hidden_act: overrides config.json's (the paper's released ReLU models say "silu").
    ffn: "auto" (twell's dispatch by measured density), "dense" or "sparse" for ReLU FFNs.
    The runtime's A/B switches (CUDA graphs, cuDNN attention, ...) are no arguments: the environment
    variable TWELL_TUNING sets them, as for `twell generate` (docs/runtime.md).
    Errors in the checkpoint or the arguments raise ValueError (bad input) or RuntimeError.
    """

    def __init__(self, path: str, device: str = "auto", hidden_act: Optional[str] = None, ffn: str = "auto"):
        if not hasattr(_twell, "NativeModel"):
            raise RuntimeError("twell.model: this twell was built without the model runtime "
                               "(configure with -DTWELL_BUILD_RUNTIME=ON)")
        self.path = str(path)
        self._m = _twell.NativeModel(self.path, device, hidden_act, ffn)
        self.last_stats = GenerateStats()

    @property
    def device(self) -> str:
        """"cpu" or "cuda"."""
        return self._m.device

    @property
    def config(self) -> dict:
        """The model's shape and ids: vocab_size, hidden_size, intermediate_size, num_layers, heads, ..."""
        return self._m.config

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        """Token ids of `text` (HF tokenizers' ids); add_special applies the post-processor's template."""
        return self._m.encode(text, add_special)

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Text of `ids` (a character cut at the end is replaced by U+FFFD)."""
        return _text(self._m.decode(list(ids), skip_special))

    def chat_prompt(self, user: str, system: str = "") -> str:
        """A single-turn chat in the model's template (ChatML or Llama-3), the assistant turn opened."""
        return self._m.chat_prompt(user, system)

    def logits(self, ids: Sequence[int]):
        """Logits of every position of one sequence: a float32 numpy array [len(ids), vocab_size]."""
        return self._m.logits(list(ids))

    def generate(self, prompt: Union[str, Sequence[int], Sequence[Union[str, Sequence[int]]]], *,
                 max_new_tokens: int = 128, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 repetition_penalty: float = 1.0, seed: int = 0, stop: Sequence[Union[str, int]] = (),
                 ignore_eos: bool = False, chat: bool = False, system: str = "",
                 on_token: Optional[Callable[[int, int], None]] = None,
                 on_text: Optional[Callable[[int, str], None]] = None, return_tokens: bool = False):
        """Continue one prompt or a batch of them (generated together).

        A prompt is text (needs the tokenizer; chat=True wraps it in the chat template, else the
        tokenizer's special-token template applies, as `twell generate` does) or a list of token ids.
        temperature 0 is greedy; otherwise top_k (0: all), top_p (1: all), repetition_penalty (1: off)
        and seed (prompt i samples with seed + i) as in `twell generate`. stop: extra stop tokens (ids
        or token strings such as "<|im_end|>"). on_token(i, id) is called as prompt i's tokens come,
        on_text(i, piece) with their text as soon as it is whole UTF-8 (special tokens left out; the
        pieces of a prompt join into its returned text).
        Returns the continuation's text for text prompts (a list of them for a batch), or Generation
        objects with return_tokens=True or id prompts. Timing of the call: `last_stats`.
        """
        single = isinstance(prompt, str) or (len(prompt) > 0 and isinstance(prompt[0], int))
        prompts = [prompt] if single else list(prompt)
        if not prompts:
            raise ValueError("generate: no prompts")
        ids, texts = [], True
        for p in prompts:
            if isinstance(p, str):
                ids.append(self.encode(self.chat_prompt(p, system) if chat else p, add_special=not chat))
            else:
                texts = False
                ids.append([int(t) for t in p])
            if not ids[-1]:
                raise ValueError("generate: a prompt encodes to no tokens")
        stop_ids = []
        for s in stop:
            if isinstance(s, str):
                t = self._m.token_id(s)
                if t is None:
                    raise ValueError(f"generate: stop token {s!r} is not a token of this tokenizer")
                stop_ids.append(t)
            else:
                stop_ids.append(int(s))
        callback = on_token
        if on_text is not None:
            decoders = [self._m.stream_decoder(True) for _ in ids]

            def callback(i, t):
                if on_token is not None:
                    on_token(i, t)
                piece = decoders[i].push(t)
                if piece:
                    on_text(i, _text(piece))

        out, times = self._m.generate(ids, max_new_tokens, temperature, top_k, top_p, repetition_penalty, seed,
                                      stop_ids, ignore_eos, callback)
        if on_text is not None:
            for i, d in enumerate(decoders):
                rest = d.flush()
                if rest:
                    on_text(i, _text(rest))
        self.last_stats = GenerateStats(times["prefill_seconds"], times["decode_seconds"], times["prefill_tokens"],
                                        times["decode_tokens"])
        gens = [Generation(list(t), r, self.decode(t, skip_special=True) if self._m.has_tokenizer else None)
                for t, r in out]
        if return_tokens or not texts:
            return gens[0] if single else gens
        return gens[0].text if single else [g.text for g in gens]
