"""The normalized description of a GenAI package that every part of the pipeline works from.

``pipeline.metadata.load_package(path)`` turns either package form into a
``PipelineSpec``:

- a ``genai_config.json`` package (one decoder, written by the
  onnxruntime-genai model builder), or
- an ``inference_metadata.yaml`` composite (vision encoder, embedding,
  decoder, ... joined by dataflow edges and run in stages).

Invariants of a ``PipelineSpec`` (checked when it is built):
- every component file exists inside the package folder;
- every dataflow edge names existing components (its ports are checked
  against the ONNX files when sessions are created);
- ``kv_inputs[i]`` pairs with ``kv_outputs[i]``;
- exactly one stage is autoregressive and its decoder is a component.
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["StatePair", "AbsentValue", "IOSpec", "ComponentSpec", "Edge", "Stage", "Positions", "SearchOptions",
           "PipelineSpec", "MetadataError", "IncompletePackageError", "RequestError"]


class MetadataError(ValueError):
    """The package description is malformed: an unknown or contradictory key, a bad value.  Names the key."""


class IncompletePackageError(ValueError):
    """The package lacks something it declares: a component file, a dataflow endpoint, a tokenizer."""


class RequestError(ValueError, RuntimeError):
    """A request the package cannot serve as asked (a prompt past ``max_length``, an unknown search option):
    a ``RuntimeError`` where onnxruntime-genai raises one, with its wording, and a ``ValueError``."""


@dataclass
class StatePair:
    """Loop-carried state: ``output`` of one step is fed to ``input`` of the next."""
    input: str
    output: str
    init: str = "zeros"      # only "zeros"
    update: str = "replace"  # only "replace"


@dataclass
class AbsentValue:
    """The value fed to an optional input nobody provides: zeros of ``shape`` (a dim may be 0)."""
    shape: list
    dtype: str = "float32"


@dataclass
class IOSpec:
    token_input: str | None = None           # receives the prompt ids, then the running token
    sequence_source: str = "token_ids"       # "token_ids" or "inputs_embeds" (decoders)
    inputs_embeds_input: str | None = None
    ids_beside_embeds: str | None = None     # a decoder reading inputs_embeds that takes the token ids too
    logits_output: str | None = None
    attention_mask_input: str | None = None
    position_ids_input: str | None = None
    kv_inputs: list = field(default_factory=list)
    kv_outputs: list = field(default_factory=list)
    kv_batch_axis: int = 0  # 1 for combined caches (2, batch, heads, positions, head_size): GPT-2's past_%d
    state_pairs: list = field(default_factory=list)     # StatePair
    optional_inputs: dict = field(default_factory=dict)  # port -> AbsentValue
    # onnxruntime-genai's paged decoder format (packed ids, block tables; caches (blocks, block_size, heads, head)):
    # its inputs by role (block_table, cumulative_sequence_lengths, past_sequence_lengths, attention_metadata
    # where the graph takes it), None for the padded format
    varlen: dict | None = None


@dataclass
class ComponentSpec:
    name: str
    filename: str        # absolute path
    type: str            # e.g. "decoder", "embedding", "vision_encoder"
    io: IOSpec = field(default_factory=IOSpec)
    tokenizer: str | None = None
    data: bytes | None = field(default=None, repr=False)  # the model's bytes, given in memory in place of the file

    @property
    def source(self):
        """What loads the model: its bytes when given in memory (``og.Config.add_model_data``), else its file."""
        return self.data if self.data is not None else self.filename


@dataclass
class Edge:
    src: str       # component name
    src_port: str  # output name
    dst: str
    dst_port: str  # input name
    dtype: str | None = None


@dataclass
class Stage:
    name: str
    kind: str            # "single_pass" or "autoregressive"
    model: str           # the component a single_pass stage runs, or the decoder of an autoregressive one
    run_on: str          # "prompt_only", "every_step" or "final_only"
    max_tokens: int | None = None


@dataclass
class Positions:
    input: str
    rank: int = 1                        # 1, or 3 for mrope
    continuation: str = "linear_increment"  # or "carry_max"


@dataclass
class SearchOptions:
    max_length: int = 128
    min_length: int = 0
    do_sample: bool = False
    top_k: int = 50
    top_p: float = 1.0
    min_p: float = 0.0
    temperature: float = 1.0
    repetition_penalty: float = 1.0
    past_present_share_buffer: bool = False
    seed: int | None = None
    # onnxruntime-genai's batch and beam options: og.Generator refuses values other than these
    batch_size: int = 1
    num_beams: int = 1
    num_return_sequences: int = 1
    length_penalty: float = 1.0
    early_stopping: bool = True
    no_repeat_ngram_size: int = 0
    diversity_penalty: float = 0.0
    chunk_size: int = 0
    # LFM2-Audio's speech output (pipeline/lfm2_audio.py): text and audio interleaved by count, the codes' sampling
    audio_interleaved: bool = False
    audio_temperature: float = 1.0
    audio_top_k: int = 4


@dataclass
class PipelineSpec:
    root: str                                   # package folder
    components: dict                            # name -> ComponentSpec (insertion order = declaration order)
    dataflow: list = field(default_factory=list)  # Edge
    stages: list = field(default_factory=list)    # Stage
    positions: Positions | None = None
    search: SearchOptions = field(default_factory=SearchOptions)
    eos_token_ids: list = field(default_factory=list)
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    context_length: int | None = None
    tokenizer_dir: str | None = None            # folder holding tokenizer.json
    model_type: str | None = None
    num_layers: int | None = None
    num_kv_heads: int | None = None
    head_size: int | None = None
    text_only: bool = False                     # admitted for text decoding only (see metadata.py)
    text_only_reason: str | None = None
    sliding_window: dict | None = None          # genai_config decoder.sliding_window, when present
    hidden_size: int | None = None
    vocab_size: int | None = None
    source: str = "genai_config"                # or "inference_metadata"
    marian_ports: tuple | None = None           # a Marian package's (encoder, decoder) port names (marian.py)
    speech_config: dict | None = None           # genai_config model.speech (the audio processor's config file)
    input_aliases: dict = field(default_factory=dict)  # a processor's output name -> the graph port it feeds
    vision_config: dict | None = None           # genai_config model.vision (processor config, port names) and
    #                                             the model's image_token_id / vision_start_token_id
    draft: dict | None = None                   # genai_config model.draft: a draft decoder (speculative.py)
    speculative: object = None                  # genai_config speculative: SpeculativeOptions
    hidden_states_input: str | None = None      # genai_config decoder.inputs.hidden_states (set_hidden_states)
    mtp: dict | None = None                     # genai_config model.mtp: the MTP head's ports (mtp.py)
    audio_output: object = None                 # genai_config model.audio_output: AudioOutputConfig (lfm2_audio.py)
    model_keys: dict = field(default_factory=dict)  # genai_config model's scalar keys (a processor's settings)

    @property
    def decoder(self) -> ComponentSpec:
        for st in self.stages:
            if st.kind == "autoregressive":
                return self.components[st.model]
        raise IncompletePackageError("the package has no autoregressive stage")
