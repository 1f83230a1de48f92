module fiar.local/devcluster/pause

go 1.26.0
