"""What reads finished runs and judges a bench: statistics, tables, plots, the report and compare."""
