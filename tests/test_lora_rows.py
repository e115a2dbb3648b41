"""The per-row deltas on their own (pipelines/lora_rows.py): Linear and Conv2d layers, rows with
one, two or no adapters at their own scales, against the delta written out row by row."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from pipelines.lora_adapters import LoraAdapter, LoraWeights
from pipelines.lora_request import LoraUse
from pipelines.lora_rows import RowLoras


def adapter(name: str, layers: dict[str, nn.Module], seed: int, rank: int) -> LoraAdapter:
    generator = torch.Generator().manual_seed(seed)
    modules = {}
    for layer_name, layer in layers.items():
        if isinstance(layer, nn.Conv2d):
            down = torch.randn(rank, layer.in_channels, *layer.kernel_size, generator=generator)
            up = torch.randn(layer.out_channels, rank, 1, 1, generator=generator)
        else:
            down = torch.randn(rank, layer.in_features, generator=generator)
            up = torch.randn(layer.out_features, rank, generator=generator)
        modules[layer_name] = LoraWeights(down, up)
    return LoraAdapter(name, Path(f"{name}.safetensors"), modules)


def written_out(layer: nn.Module, weights: LoraWeights, x: torch.Tensor) -> torch.Tensor:
    if isinstance(layer, nn.Conv2d):
        hidden = nn.functional.conv2d(x, weights.down, stride=layer.stride, padding=layer.padding)
        return nn.functional.conv2d(hidden, weights.up)
    return x @ weights.down.T @ weights.up.T


@pytest.mark.parametrize("layer, shape", [(nn.Linear(6, 5), (4, 3, 6)),
                                          (nn.Conv2d(3, 4, 3, padding=1), (4, 3, 5, 5))], ids=["linear", "conv2d"])
def test_each_row_gets_the_sum_of_its_own_adapters_at_its_own_scales(layer, shape):
    torch.manual_seed(0)
    layers = {"layer": layer}
    a, b = adapter("a", layers, seed=1, rank=2), adapter("b", layers, seed=2, rank=3)
    loras = RowLoras(layers)
    loras.add(a)
    loras.add(b)
    x = torch.randn(shape)
    rows = [(LoraUse("a", 0.5),), (), (LoraUse("a", 1.0), LoraUse("b", -2.0)), (LoraUse("b", 0.25),)]
    base = layer(x)
    with torch.no_grad(), loras.rows(rows, torch.device("cpu"), torch.float32):
        mixed = layer(x)
    wa, wb = a.modules["layer"], b.modules["layer"]
    expected = base.clone()
    expected[0] += 0.5 * written_out(layer, wa, x[:1])[0]
    expected[2] += written_out(layer, wa, x[2:3])[0] - 2.0 * written_out(layer, wb, x[2:3])[0]
    expected[3] += 0.25 * written_out(layer, wb, x[3:4])[0]
    assert torch.allclose(mixed, expected, atol=1e-5)
    assert torch.equal(mixed[1], base[1])  # the row without adapters is the base layer's, exactly
    with torch.no_grad():
        assert torch.equal(layer(x), base)  # outside a forward's rows: the base layer


def test_a_layer_only_some_adapters_change_and_a_model_that_folds_the_batch():
    first, second = nn.Linear(4, 4), nn.Linear(4, 4)
    loras = RowLoras({"first": first, "second": second})
    loras.add(adapter("a", {"first": first}, seed=3, rank=2))
    x = torch.randn(2, 4)
    with torch.no_grad(), loras.rows([(LoraUse("a"),), ()], torch.device("cpu"), torch.float32):
        assert torch.equal(second(x), nn.functional.linear(x, second.weight, second.bias))
        with pytest.raises(RuntimeError, match="LoRA rows: first saw 3 rows, the forward has 2"):
            first(torch.randn(3, 4))
    with pytest.raises(ValueError, match="a LoRA named 'a' is already loaded"):
        loras.add(adapter("a", {"first": first}, seed=4, rank=1))
