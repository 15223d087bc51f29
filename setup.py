"""Package discovery for setuptools (the metadata is in pyproject.toml).

Every package under ``ckpt_tool/`` is found, so a new one can never be left out of the wheel;
the sbatch templates live in ``slurm_templates/`` at the top of the repository and ship inside
the wheel as ``ckpt_tool.slurm_templates``.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["ckpt_tool", "ckpt_tool.*"]), "ckpt_tool.slurm_templates"],
    package_dir={"ckpt_tool.slurm_templates": "slurm_templates"},
    package_data={"ckpt_tool.slurm_templates": ["*.tmpl", "*.sbatch"]},
)
