#!/bin/bash
echo '{"name": "t1"}' > config.json
