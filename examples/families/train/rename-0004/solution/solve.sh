#!/bin/bash
mv lines.txt output.txt
