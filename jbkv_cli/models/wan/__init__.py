"""The Wan2.1 lineage: Self-Forcing (and its descendants), Rolling Forcing, SkyReels-V2, Matrix-Game-2."""
