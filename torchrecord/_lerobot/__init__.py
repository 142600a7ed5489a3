"""LeRobot episodes: a LeRobot v3.0 dataset's frames read back as LeRobot's LeRobotDataset gives them."""
