"""MLflow: the only package that imports mlflow. Step runs and the pipeline parent run (runs), the model
registry (registry) and promotion (promotion)."""
