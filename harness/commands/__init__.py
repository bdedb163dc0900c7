"""The subcommands of ``kvfence COMMAND`` (kvfence.cli), one module each: its parser beside its handler.

The entry stage: a command module may import every earlier stage of ``kvfence``; nothing earlier imports it.
``common`` holds the argparse pieces the commands share.
"""
