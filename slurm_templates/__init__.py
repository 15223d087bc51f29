# slurm_templates is the package ckpt_tool.slurm_templates (see pyproject.toml)
