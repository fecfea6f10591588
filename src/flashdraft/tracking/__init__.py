"""MLflow: the only package that imports mlflow. Step runs (runs), the pipeline's parent run
(pipeline_run), the model registry (registry) and promotion (promotion)."""
