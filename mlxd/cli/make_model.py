"""`mlxd make-model`: write an mlx-lm model directory with seeded random weights, offline."""

from __future__ import annotations

from pathlib import Path

import click

from mlxd.errors import ConfigError, MlxdError

CONFIG_ERROR = 2
_DTYPES = ("float32", "bfloat16", "float16")


class _ConfigFailure(click.ClickException):
    """A ConfigError on one stderr line, exiting 2 as every mlxd config failure does."""

    exit_code = CONFIG_ERROR


# --arch and --size are plain strings: presets.py owns the valid pairs and names them all in one
# line, where click.Choice would print a multi-line usage block.
@click.command("make-model")
@click.option(
    "--arch",
    default="qwen3",
    show_default=True,
    help="qwen3, llama, qwen2, mistral, mamba (state-space), lfm2 (hybrid), or llava, gemma3, "
    "qwen2_5_vl, qwen3_vl, qwen3_vl_moe, qwen3_5_vl, qwen3_5_moe_vl, smolvlm, idefics3, mistral3, "
    "llama4, gemma4 or gemma4_bidirectional (its image tokens attend both ways) (vision-language "
    "models; need mlxd[vision]; --size, --dtype, --quantize and --sliding-window are ignored; "
    "with --zoo, gemma3 and gemma4 are the zoo's text models).",
)
@click.option(
    "--size",
    default="tiny",
    show_default=True,
    help="tiny, small, deep (tiny with 28 layers), or a real shape such as qwen3-0.6b.",
)
@click.option(
    "--out", "out_dir", required=True, type=click.Path(path_type=Path), help="Directory to create."
)
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(_DTYPES))
@click.option(
    "--quantize",
    "quantize_bits",
    type=click.Choice(["4", "8"]),
    default=None,
    help="Quantize to 4 or 8 bits (group size 64).",
)
@click.option(
    "--sliding-window",
    type=int,
    default=None,
    help="Every other layer attends to only this many recent tokens (llama, mistral).",
)
@click.option("--seed", default=0, show_default=True, help="Same seed, same weights.")
@click.option(
    "--zoo",
    is_flag=True,
    help="--arch names any mlx-lm text architecture (mlxd.models.zoo), built tiny, every layer "
    "kind present; --size, --dtype, --quantize and --sliding-window are ignored.",
)
@click.option("--force", is_flag=True, help="Overwrite --out if it exists.")
def make_model_command(
    arch: str,
    size: str,
    out_dir: Path,
    dtype: str,
    quantize_bits: str | None,
    sliding_window: int | None,
    seed: int,
    zoo: bool,
    force: bool,
) -> None:
    """Make a model with random weights for tests and benchmarks; no network needed."""
    if out_dir.exists() and not force:
        raise click.ClickException(f"{out_dir} already exists (use --force to overwrite)")
    # Imported here so `mlxd --help` does not pay for MLX.
    from mlxd.models.maker import make_model
    from mlxd.models.vlm_maker import VLM_ARCHS, make_vlm
    from mlxd.models.zoo import make_zoo_model

    try:
        if arch in VLM_ARCHS and not zoo:  # --zoo --arch gemma3: the zoo's text-only wrapper
            make_vlm(out_dir, arch=arch, seed=seed, overwrite=force)
            return
        if zoo:
            make_zoo_model(out_dir, arch, seed=seed, overwrite=force)
            return
        make_model(
            out_dir,
            arch=arch,
            size=size,
            dtype=dtype,
            quantize_bits=None if quantize_bits is None else int(quantize_bits),
            sliding_window=sliding_window,
            seed=seed,
            overwrite=force,
        )
    except ConfigError as exc:
        raise _ConfigFailure(exc.message) from None
    except MlxdError as exc:
        raise click.ClickException(exc.message) from None
