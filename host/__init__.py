"""agoc's host side: the `agoc` CLI (typer + rich) and the devices it runs artifacts on."""
