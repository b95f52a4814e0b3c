"""The secret scan: runs our rules and the maintained catalogue (Kingfisher) over files, layers, images."""
