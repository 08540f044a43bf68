"""The `localspec` command: click commands, the terminal chat and its rendering, the doctor's report."""
