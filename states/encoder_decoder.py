"""Encoder-decoder models (T5, mT5): embeddings come from the encoder alone, as in
sentence-T5. T5's relative position bias is computed from a padded layout, so the
encoder runs padded; mean pooling by default."""

from __future__ import annotations

import torch
from torch import nn

from states.interface import Execution, ModelState, Pack, unpad_output, find_pretrained, to_padded


class EncoderDecoderState(ModelState):
    kind = "encoder_decoder"
    default_pooling = "mean"

    def __init__(self, model: nn.Module, execution: Execution = "auto") -> None:
        super().__init__(model, execution)
        self.encoder = find_pretrained(model).get_encoder()  # through PEFT / user wrappers

    def hidden_states(self, pack: Pack, all_layers: bool = False) -> torch.Tensor:
        padded = to_padded(pack, self.pad_id)
        padded.pop("token_type_ids", None)
        out = self.encoder(**padded, output_hidden_states=all_layers)
        return unpad_output(out, padded["attention_mask"], all_layers)
