"""The distribution strategy of a `tfam train` run, and where each worker of a multi-worker run writes."""

import os

import tensorflow as tf


def configure_cpu_devices(count):
    """Splits the CPU into `count` logical devices (before TensorFlow starts)."""
    if count and count > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)


def choose_strategy(name):
    """MultiWorkerMirrored with TF_CONFIG; Mirrored over several GPUs (or logical CPUs); else default."""
    if name == "multi_worker" or (name == "auto" and os.environ.get("TF_CONFIG")):
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    if name == "mirrored":
        devices = gpus or tf.config.list_logical_devices("CPU")
        return tf.distribute.MirroredStrategy([d.name for d in devices])
    if name == "auto" and len(gpus) > 1:
        return tf.distribute.MirroredStrategy([d.name for d in gpus])
    return tf.distribute.get_strategy()


def is_chief(strategy):
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return True
    return resolver.task_type == "chief" or (resolver.task_type == "worker" and resolver.task_id == 0)


def worker_dir(run_dir, strategy):
    """Non-chief workers of a multi-worker run write beside the chief, not over it."""
    if is_chief(strategy):
        return run_dir
    resolver = strategy.cluster_resolver
    return os.path.join(run_dir, f"{resolver.task_type}_{resolver.task_id}")
