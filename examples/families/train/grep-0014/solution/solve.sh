#!/bin/bash
grep error data.txt > answer.txt
