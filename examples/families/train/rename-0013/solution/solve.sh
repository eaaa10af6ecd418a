#!/bin/bash
mv records.txt output.txt
