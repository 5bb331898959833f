"""What `tfam train` reports at the end: the protocol it measured and the summary it prints."""


def protocol_label(config):
    if config.train_split == "train":
        return f"WikiText-2 {config.eval_split} split"
    return (
        f"mini protocol: trained on {config.train_split}, evaluated on {config.eval_split} "
        "(not WikiText-2 test perplexity)"
    )


def format_summary(summary):
    v = summary["validation"]
    rate = summary["tokens_per_second"]
    if "bits_per_character" in v:
        # A character stream has no words: bits per character is its measure.
        quality = (
            f"  loss {v['loss']:.4f} nats/char   bits per character {v['bits_per_character']:.4f}   "
            f"char perplexity {v['token_perplexity']:.2f}   ({v['characters']} characters; a character-level "
            "run is measured per character, not per word)"
        )
    else:
        quality = (
            f"  loss {v['loss']:.4f} nats/token   token perplexity {v['token_perplexity']:.2f}   "
            f"word perplexity {v['word_perplexity']:.2f}   ({v['tokens']} tokens, {v['words']} words)"
        )
    lines = [
        "=" * 72,
        f"tfam train: {summary['steps']} steps on {summary['replicas']} replica(s)"
        + (f" (resumed at step {summary['resumed_from_step']})" if summary["resumed_from_step"] else "")
        + (" -- STOPPED: loss became NaN" if summary["stopped_on_nan"] else ""),
        f"validation ({summary['protocol']}):",
        quality,
        f"throughput: {rate:.0f} tokens/s (median over the --log-every intervals)"
        if rate
        else "throughput: n/a (no step timed: a fit's first one compiles)",
        f"best checkpoint: {summary['best_checkpoint']}",
        f"export: {summary['export']}",
        f"TensorBoard: tensorboard --logdir {summary['logs']}",
        "=" * 72,
    ]
    return "\n".join(lines)
