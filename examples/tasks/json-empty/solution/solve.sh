#!/bin/bash
echo '{}' > empty.json
