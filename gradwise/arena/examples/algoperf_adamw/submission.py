"""An AlgoPerf submission (PyTorch, external tuning): gradwise's AdamW with linear warmup and cosine decay.

Written against AlgoPerf's submission API (mlcommons/algorithmic-efficiency v0.6), so it runs in AlgoPerf as it
is, and in gradwise's arena: ``gradwise arena run --submission gradwise/arena/examples/algoperf_adamw/submission.py``
(the hyperparameters come from the ``tuning_search_space.json`` beside it).
"""
import math

import torch
import torch.distributed.nn as dist_nn
from algoperf import spec
from algoperf.pytorch_utils import pytorch_setup

import gradwise

USE_PYTORCH_DDP = pytorch_setup()[0]

BATCH_SIZES = {"digits_cnn": 64, "lstsq_ill_conditioned": 64, "teacher_student": 128, "mnist1d_cnn": 128,
               "shakespeare_charlm": 16, "criteo1tb": 262_144, "fastmri": 32, "imagenet_resnet": 1024,
               "imagenet_vit": 1024, "librispeech_conformer": 256, "librispeech_deepspeech": 256, "ogbg": 512,
               "wmt": 128, "mnist": 16}


def get_batch_size(workload_name):
    if workload_name not in BATCH_SIZES:
        raise ValueError(f"Unsupported workload name: {workload_name}.")
    return BATCH_SIZES[workload_name]


def init_optimizer_state(workload, model_params, model_state, hyperparameters, rng):
    del model_state, rng
    optimizer = gradwise.AdamW(model_params.parameters(), lr=hyperparameters.learning_rate,
                               betas=(1.0 - hyperparameters.one_minus_beta1, hyperparameters.beta2),
                               weight_decay=hyperparameters.weight_decay, compile=False)
    warmup = max(1, int(hyperparameters.warmup_factor * workload.step_hint))

    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, workload.step_hint - warmup))))

    return {"optimizer": optimizer, "scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, factor)}


def update_params(workload, current_param_container, current_params_types, model_state, hyperparameters, batch,
                  loss_type, optimizer_state, eval_results, global_step, rng, train_state=None):
    del current_params_types, loss_type, eval_results, train_state
    model = current_param_container
    model.train()
    optimizer_state["optimizer"].zero_grad()
    logits, new_model_state = workload.model_fn(
        params=model, augmented_and_preprocessed_input_batch=batch, model_state=model_state,
        mode=spec.ForwardPassMode.TRAIN, rng=rng, update_batch_norm=True,
        dropout_rate=getattr(hyperparameters, "dropout_rate", 0.0))
    loss_dict = workload.loss_fn(label_batch=batch["targets"], logits_batch=logits, mask_batch=batch.get("weights"),
                                 label_smoothing=getattr(hyperparameters, "label_smoothing", 0.0))
    summed, n_valid = loss_dict["summed"], loss_dict["n_valid_examples"]
    if USE_PYTORCH_DDP:  # AlgoPerf on several GPUs: the mean over the global batch
        summed, n_valid = dist_nn.all_reduce(summed), dist_nn.all_reduce(n_valid)
    loss = summed / n_valid
    loss.backward()
    if getattr(hyperparameters, "grad_clip", None) is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=hyperparameters.grad_clip)
    optimizer_state["optimizer"].step()
    optimizer_state["scheduler"].step()
    if workload.metrics_logger is not None and global_step % 100 == 0:
        workload.metrics_logger.append_scalar_metrics({"loss": loss.item()}, global_step)
    return optimizer_state, current_param_container, new_model_state


def prepare_for_eval(workload, current_param_container, current_params_types, model_state, hyperparameters,
                     loss_type, optimizer_state, eval_results, global_step, rng):
    del workload, current_params_types, hyperparameters, loss_type, eval_results, global_step, rng
    return optimizer_state, current_param_container, model_state


def data_selection(workload, input_queue, optimizer_state, current_param_container, model_state, hyperparameters,
                   global_step, rng):
    del workload, optimizer_state, current_param_container, model_state, hyperparameters, global_step, rng
    return next(input_queue)
