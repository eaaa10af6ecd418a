#!/bin/bash
chmod +x run.sh
