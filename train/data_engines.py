"""The ``data`` keys that choose what makes the training data (mixed into ``train.recipe.DataSection``):
which engine regenerates the responses, with which sampling and thinking mode, which engine computes the target
features and how they are stored. The vLLM engines run the target in vLLM's own venv (``scripts/vllm-venv.sh``;
:mod:`train.vllm_data`); a recipe that asks for them where that venv is missing is refused before the target loads
(``train.recipe_data.recipe_data_file``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class DataEngines(BaseModel):
    # data.regenerate: drafterkit's own engine (decode.generate) or vLLM (train.vllm_data), same prompts and sampling
    regenerate_engine: Literal["drafterkit", "vllm"] = "drafterkit"
    regenerate_temperature: float = Field(0.0, ge=0.0)  # 0: greedy (the default, what exactness relies on)
    regenerate_top_k: int = Field(0, ge=0)  # 0: off
    regenerate_top_p: float = Field(1.0, gt=0.0, le=1.0)
    # reasoning templates (Qwen3): the regenerated responses' prompts with thinking on (the target writes a
    # <think> block) or off (the template's empty block), the template's enable_thinking; None: as the data renders
    thinking: bool | None = None
    # the offline feature cache's source: a transformers forward of the target, or vLLM's extract_hidden_states
    features_engine: Literal["transformers", "vllm"] = "transformers"
    feature_dtype: Literal["bfloat16", "float32"] = "bfloat16"  # the cache's storage dtype (bf16: half the disk)
    # vLLM's tensor_parallel_size for both vLLM engines: the target split over this many GPUs (or CPU processes)
    vllm_tensor_parallel_size: int = Field(1, ge=1)
