// A text-to-image pipeline as `optimum-cli export onnx` writes a diffusers Stable Diffusion or SDXL
// pipeline: no pipeline.json, every setting read from the export's own files as diffusers reads
// them (docs/pipelines.md, "Export folders" and "SDXL"):
//   model_index.json                      the pipeline's class (StableDiffusionXLPipeline: SDXL;
//                                         force_zeros_for_empty_prompt)
//   tokenizer/vocab.json, merges.txt      CLIP BPE; tokenizer_config.json: model_max_length, pad_token
//   text_encoder/model.onnx               input_ids -> last_hidden_state
//   unet/model.onnx (+ external data)     sample, timestep, encoder_hidden_states -> out_sample
//   unet/config.json                      sample_size, in_channels: the latent
//   vae_decoder/model.onnx                latent_sample -> sample
//   vae_decoder/config.json               scaling_factor, block_out_channels (image = latent x 2^(n-1))
//   scheduler/scheduler_config.json       _class_name and the scheduler's fields
//   SDXL: tokenizer_2/, text_encoder_2/   the second encoder (hidden_states.<n-1> of both, text_embeds);
//         unet/config.json                addition_embed_type "text_time" (text_embeds, time_ids inputs);
//         vae_decoder/config.json         force_upcast
//   unet<-|_|.><suffix>/model.onnx      a quantized UNet export beside the FP16 one (the TensorRT
//   (or model_optimized.onnx)          demo's unet[xl]-int8.l3..., ModelOpt's --onnx-dir copied in):
//                                      a variant of the UNet named after its folder ("variants")
// Input types (input_ids, timestep) are the graphs' own (Txt2ImgModels::load reads them).
#pragma once

#include <filesystem>
#include <optional>

#include "eval/pipelines/pipeline_config.h"

namespace qeval::eval {

// A folder with a model_index.json and no pipeline.json.
bool is_diffusers_folder(const std::filesystem::path& dir_or_file);

// Reads the export folder above. `scheduler` replaces the folder's scheduler class (the run
// config's "scheduler"): the file's fields are then read with that class's defaults, as diffusers'
// `from_config` does. InputError names the file and key for anything missing, malformed or not
// supported (another XL class, a PyTorch-only folder, UNet or VAE settings that add inputs or
// change the arithmetic, a scheduler class or option qeval does not implement, which the message
// says how to replace).
Txt2ImgConfig read_diffusers_txt2img(const std::filesystem::path& dir,
                                     std::optional<SchedulerType> scheduler = std::nullopt);

}  // namespace qeval::eval
