"""The `agoc` commands, one module per group: options in, a settings record, one library call, rendering."""
