"""Everything that only reads a run folder: tables, statistics, plots, the HTML page, the gate."""
